"""From a source's rows to batches: documents packed into rows (`packing`), domains mixed by
proportion (`mixture`), and the grain train iterator, eval batches and probe pool (`loader`)."""
