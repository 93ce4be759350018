"""The web page's static assets (index.html, app.js, app.css), shipped as package data.

A package of its own so that `importlib.resources` finds the files in an
installed wheel as well as in a source checkout; `service/api/web.py` serves them.
Plain files with no build step: what is here is exactly what the browser runs.
"""
