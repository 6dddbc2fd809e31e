"""Serving a classroom: several Streamlit processes behind a sticky reverse proxy (docs/deploy.md)."""
