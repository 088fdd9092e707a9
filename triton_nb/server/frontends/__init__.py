"""The network front ends and what they share: the protocols' codecs, shared memory, SageMaker's contract.

They reach the server through :class:`triton_nb.server.service.InferenceService` only (``tests/test_layering.py``)."""
