"""What the server reports about itself: statistics, metrics, why each batch left, and the logging settings."""
