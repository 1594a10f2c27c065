void lib_fire(int a, long b);
