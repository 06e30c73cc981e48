"""The mesh's contract: what the store holds, what the watch feed says, and how both are read.

Below the registry (which writes it) and the router (which follows it), so neither imports the other;
it may import ``auth`` (the credentials' records) and the SDK's registration schema, nothing above.
"""
