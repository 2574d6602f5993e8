"""`specproxy bench`: the lab's table, measured on the configured backends one at a time."""
