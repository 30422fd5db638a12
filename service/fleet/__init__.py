"""Fleet views: the topology graph with health and the NOC summary."""
