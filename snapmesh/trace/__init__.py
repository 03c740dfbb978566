"""`snapmesh trace`: the message flow of a run, from its transfer logs.

    logs.py     the data dir's log files (segments too) -> records in lsn order
    clocks.py   records -> events with vector clocks and Lamport times (pure)
    shiviz.py   events -> a ShiViz / GoVector log (pure)
    layout.py   events -> a space-time diagram's geometry (pure)
    svg.py      geometry -> SVG text; PNG through cairosvg
    (the command line is snapmesh/commands/trace.py)
"""
