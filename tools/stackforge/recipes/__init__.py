"""Recipes: how to serve one model from one built image, and how to prove it serves.

``recipes/<name>.yaml`` is validated on load (``model``), read with positions (``load``), checked
against the repository and a built image (``lint``) and rendered into the cookbook (``docs``).
``stackforge smoke`` consumes the typed rows of ``Recipe.smoke``.
"""
