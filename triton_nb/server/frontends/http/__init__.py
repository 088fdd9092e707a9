"""The KServe v2 / Triton HTTP front end: the ASGI application and its connections."""
