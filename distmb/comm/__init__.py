"""distmb/comm."""
