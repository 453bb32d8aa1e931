"""Training the built-in models from simulator rollouts (the reference policy's networks)."""
