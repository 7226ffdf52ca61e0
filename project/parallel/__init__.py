"""The thin layer that turns the seed's DP/DDP scenarios into Lightning strategies and device lists."""
