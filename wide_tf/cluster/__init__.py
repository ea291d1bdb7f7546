"""A study on a Ray cluster: the driver (ray_study) and the accelerator hosts' actor (host)."""
