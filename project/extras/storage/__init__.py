"""A run directory in object storage: records and checkpoints under an fsspec URL, a local folder as its cache.

When the logger's ``save_dir`` is a URL (``s3://bucket/prefix``, ``gs://``, ``az://``, ``file://``), the run works
in a local scratch folder exactly as it would on a shared disk, and this layer makes the store the record:

- :mod:`store`: the core's :class:`~project.run_store.RunStore` for URLs (``layer.py`` registers it) and the
  ``--storage_options`` option;
- :mod:`location`: the URL, its local scratch folder and the file system (credentials from the environment only);
- :mod:`objects`: what the layer asks of a store: put with a digest, get atomically, create-if-absent,
  replace-if-unchanged;
- :mod:`commits`: commit-then-point: a checkpoint's data first, then one small commit object naming it;
- :mod:`lease`: one training per run without ``fcntl``: a lease object with a heartbeat and an expiry;
- :mod:`records`: config.yaml, plan.json, events, export/ and predictions uploaded beside the checkpoints;
- :mod:`pull`: a run resumed from an empty disk: the committed checkpoints brought into the cache.
"""
