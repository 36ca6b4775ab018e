"""distmb/config."""
