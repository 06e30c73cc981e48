"""Semantic intent matching: a caller says what it needs in words; the router finds the capability or refuses.

settings (config, no extra needed) · embedder (models, worker thread) · index (capability vectors)
· cache (intent vectors) · matcher (the pure decision) · resolver (SemanticRouter: what the router
calls) · calibrate (threshold and margin from a labelled set).
"""
