"""distmb/halo/hec."""
