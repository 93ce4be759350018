"""HTTP routes, one package per feature (router, protocol, serving)."""
