"""Day-two operations on a running cluster: rolling upgrades, node removal and cluster health, one node at a time and health-gated."""
