"""Results of a replay: metrics tables and the decision log (writer, reader, schema)."""
