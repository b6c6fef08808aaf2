"""The search: what a property check is run on, drawn by Hypothesis and shrunk.

    case          ``Case``: one drawn input (the op's arguments by name, notes, mask)
    strategies    the case strategies: shapes, values, layouts, masks, buckets of hard shapes
    fitting       a drawn case fitted into a kernel's declared domain
    modes         the calling modes a served kernel is called under

Imports ``oracle``, ``impls`` and ``properties.declared``; nothing above.
"""
