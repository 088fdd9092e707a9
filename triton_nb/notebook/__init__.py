"""The notebook face of triton_nb: IPython magics (``%load_ext triton_nb``) and the tuning panel.

Imported lazily: nothing here loads unless a notebook asks for it.
"""
