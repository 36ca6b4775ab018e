"""distmb/core."""
