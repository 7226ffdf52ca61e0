"""The template's optional layers, one folder each; the core finds them here (project/layers.py) and names none.

``make strip EXTRAS="sweep tracking"`` (or ``EXTRAS=all``) deletes layers with their tests, docs and configs;
README's "Make it yours" lists each layer, its size and what it adds.
"""
