// relpos: command-line tool for BoTNet / SASA image models with 2D relative positions.
#include <iostream>

#include "cli_common.hpp"
#include "relpos/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"relpos: image classification with 2D relative-position self-attention (BoTNet, SASA)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "relpos 0.1.0");
  relpos::cli::register_classify(app);
  relpos::cli::register_eval(app);
  relpos::cli::register_train(app);
  relpos::cli::register_info(app);
  relpos::cli::register_convert(app);
  relpos::cli::register_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const relpos::Error& e) {
    std::cerr << "relpos: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "relpos: error: " << e.what() << "\n";
    return 1;
  }
  return relpos::cli::exit_status();
}
