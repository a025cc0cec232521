"""Pages, page sources, the page table and page-affinity placement (issue M6)."""
