"""Serving: the model wrapped for queries, the learning service and its HTTP app."""
