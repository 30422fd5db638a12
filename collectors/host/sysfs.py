"""Where a host's sysfs classes are, whichever root the inventory names."""

from __future__ import annotations

from pathlib import Path


def sysfs_class_dir(root: Path | str, cls: str) -> Path:
    """`root/class/<cls>` when root is the sysfs mount itself (`/sys`); `root/sys/class/<cls>` when root
    holds a `sys/` folder (`/`, a host's root mounted into a container at `/host`, a test fixture tree)."""
    root = Path(root)
    if (root / "class").is_dir() and not (root / "sys").is_dir():
        return root / "class" / cls
    return root / "sys" / "class" / cls
