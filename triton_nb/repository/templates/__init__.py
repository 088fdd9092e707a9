"""Files copied into exported model repositories (``model.py`` of Python-backend models).

They run inside Triton's Python backend, not as part of triton_nb: each imports only numpy,
``triton_python_backend_utils`` and the standalone modules the exporter ships beside it.
"""
