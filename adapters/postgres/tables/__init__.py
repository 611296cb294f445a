"""The tables of adapters/postgres/schema.py, one module per group, by what they hold."""
