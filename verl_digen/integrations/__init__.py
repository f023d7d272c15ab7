"""Optional integrations with other frameworks; each one is inert when its framework is not installed."""
