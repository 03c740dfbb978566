"""The node's machines: the channel and snapshot core, the node that hosts the app, its log's recovery."""
