"""A regression example beside digits: ``configs/diabetes/diabetes.yaml``.

It trains :mod:`.regressor`'s ``Regressor`` (MSE, ``val/mse``, ``val/mae``) around the core's ``MLP`` on
scikit-learn's embedded diabetes set, through a plain LightningDataModule (:mod:`.data`, over :mod:`.arrays`'
tensors). The core knows none of them: the config names them by class path. See docs/extras/diabetes.md.
"""
