"""Serving: an OpenAI-compatible HTTP server over ``d3d.generate`` (``python -m d3d serve``)."""
