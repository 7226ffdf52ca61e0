"""Plain networks (no Lightning imports) and the LightningModules that train them."""
