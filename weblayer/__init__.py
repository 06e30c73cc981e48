"""The web layer the registry's, the router's and the console's HTTP APIs share: the error envelope and the
exception that carries it, JSON answers, bodies decoded into Structs, the admin-only guard and the error
middleware. It sits below all three (it imports aiohttp, msgspec and the SDK, nothing of the mesh's parts),
so an error reads the same whichever part answered it."""
