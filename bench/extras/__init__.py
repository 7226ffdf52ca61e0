"""The bench's parts that layers add, one folder each (``bench/tasks.py`` finds them; ``make strip`` deletes them)."""
