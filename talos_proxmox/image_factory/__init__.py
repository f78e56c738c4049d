"""The Talos Image Factory: schematic ids computed locally, image and installer URLs, and registration over HTTP."""
