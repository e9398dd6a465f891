"""A memory probe for routers under the bench (sitecustomize.py here says how to run it)."""
