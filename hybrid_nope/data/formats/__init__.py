"""How data is stored: mosaicml-streaming's MDS (`mds`), the files users keep text in
(`text_files`) and the length index of a text source (`text_index`). No module here knows a
`data.source` name."""
