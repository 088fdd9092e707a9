"""The model manager and what it does per model version: the request checks, the instances and their warm-up."""
