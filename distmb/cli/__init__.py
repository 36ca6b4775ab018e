"""distmb/cli."""
