"""What a kernel declares about itself, read by the registry's record (``impls.Impl``).

    domain        the inputs it supports and its contract choices (``Domain``, ``parse``)
    conventions   how it writes its outputs (in place, ``out``, ``out=``) and the adapter that calls
                  it under the out-of-place contract
    signature     the op's options (arguments it gained later) a kernel's signature takes; those it
                  does not are outside its domain

The lowest layer of ``properties``: it imports only ``oracle``, so that ``impls`` (the registry and
the kernels) can build its records from it; everything above may import it.
"""
