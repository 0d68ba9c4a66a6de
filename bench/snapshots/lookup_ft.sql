\set n random(1, 10000)
SELECT v FROM snapbench.big WHERE k = 'k' || :n;
