"""distmb/data/store."""
