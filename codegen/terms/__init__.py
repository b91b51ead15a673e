"""Per-family term builders: what one kernel family's templates and tables need, composed from the
index algebra of ``codegen.index``, which stays the one place index arithmetic is derived; the
builders here only substitute, split, evaluate and print its maps, as CUTLASS keeps a problem's
sizes apart from each kernel's iterators.  Each module serves the family it is named after:
``gemm`` the GEMM core that implicit_gemm and im2win share, ``implicit_gemm`` the TMA kernel's
operands, ``im2win`` the window tensor, ``direct`` the spatial tiles.  ``codegen.index`` (the
algebra and the template context every family shares) imports none of them.
"""
