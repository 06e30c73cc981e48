"""How the router reaches one agent instance: one module per protocol behind one small interface.

``base.Transport`` sends one call with its deadlines (and relays a streamed answer) and classifies what came
back into one ``answer.AgentAnswer``, whatever the protocol; router/forward.py picks the transport of an
instance's protocol. The HTTP protocols (``atp``, ``rest``, ``a2a``) share one exchange (``http``) and differ
only in their dialect: how a call is written and how an answer and a stream's events are read.
"""
