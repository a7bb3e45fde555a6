#include <iostream>

#include "apps/cli.h"

int main(int argc, char** argv) { return mixprec::run_cli(argc, argv, std::cout, std::cerr); }
