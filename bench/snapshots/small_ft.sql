SELECT count(*) FROM snapbench.small;
