"""The HTTP service: the Ray Serve deployment, its FastAPI app and security, the console and the API docs page."""
