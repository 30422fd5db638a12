"""The built-in NOC page: static HTML, CSS and plain JavaScript, live over SSE."""
