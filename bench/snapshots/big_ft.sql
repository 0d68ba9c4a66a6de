SELECT count(*) FROM snapbench.big;
