// relpos: command-line tool for BoTNet / SASA image models with 2D relative positions.
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>

#include "cli_common.hpp"
#include "relpos/error.hpp"
#include "relpos/runtime.hpp"
#include "relpos/version.hpp"

namespace {
// The subcommand the user named (the deepest one parsed), or the app itself.
const CLI::App* named_command(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) return sub;
  return &app;
}

std::string usage_line(const CLI::App& app) {
  const CLI::App* cmd = named_command(app);
  std::string name = cmd == &app ? "relpos" : "relpos " + cmd->get_name();
  std::string line = "usage: " + name;
  if (cmd == &app) return line + " COMMAND [OPTIONS] (relpos --help lists the commands)";
  line += " [OPTIONS]";
  for (const CLI::Option* o : cmd->get_options())
    if (o->get_positional()) line += " " + o->get_name() + (o->get_items_expected_max() > 1 ? "..." : "");
  return line + " (relpos " + cmd->get_name() + " --help for all options)";
}

// Results that did not reach standard output (a full disk, /dev/full, a closed descriptor) make the
// run a failure: without this, the exit status said success over a cut-off file.
int with_output_checked(int status) {
  // A stream that failed earlier writes nothing more and sets no errno: it is cleared to try the
  // rest once more, which gives the reason (a full disk), and is a failure whatever that gives.
  const bool failed_before = !std::cout || std::ferror(stdout) != 0;
  std::cout.clear();
  std::clearerr(stdout);
  errno = 0;
  std::cout.flush();
  const bool failed = failed_before || !std::cout || std::fflush(stdout) != 0 || std::ferror(stdout) != 0;
  if (!failed) return status;
  const int err = errno ? errno : relpos::cli::output_error();  // (a stream already failed sets none now)
  std::cerr << "relpos: error: cannot write the results to standard output" << (err ? std::string(": ") + std::strerror(err) : "")
            << "\n";
  return status != 0 ? status : relpos::cli::kExitFailure;
}
// Ctrl-C, kill or a closed terminal while a file is being written: its temporary
// ("<name>.tmp.<pid>") goes with the process, which then ends by the signal as before (the exit
// status the shell shows stays 128 + the signal). A signal the parent set to be ignored (nohup's
// SIGHUP) stays ignored. `train` puts its own handlers in place for its run (a checkpoint first).
extern "C" void on_stop_signal(int sig) {
  relpos::remove_temporary_files();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void remove_temporaries_on_signals() {
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}
}  // namespace

int main(int argc, char** argv) {
  remove_temporaries_on_signals();
  CLI::App app{"relpos: image classification with 2D relative-position self-attention (BoTNet, SASA)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "relpos " + relpos::version());  // the library's, as it runs
  // The library's messages (skipped images, ...) on their own line, clear of a progress bar.
  const bool tty = isatty(STDERR_FILENO) != 0;
  relpos::set_log_handler([tty](const std::string& message) {
    std::cerr << (tty ? "\r\033[K" : "") << "relpos: " << relpos::cli::terminal_safe(message) << "\n";
  });
  relpos::cli::register_classify(app);
  relpos::cli::register_eval(app);
  relpos::cli::register_train(app);
  relpos::cli::register_info(app);
  relpos::cli::register_convert(app);
  relpos::cli::register_bench(app);
  relpos::cli::register_explain(app);
  relpos::cli::register_quantize(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success))
      return with_output_checked(app.exit(e));  // --help, --version
    // A usage error: the message, the usage line, exit 2 (as getopt-style tools do).
    std::string message = e.what();
    if (app.get_subcommands().empty() && (argc == 1 || argv[1][0] != '-')) {  // no command, or not one
      message = argc == 1 ? "no command given (" : "'" + std::string(argv[1]) + "' is not a relpos command (";
      const auto all = app.get_subcommands([](CLI::App*) { return true; });
      for (std::size_t i = 0; i < all.size(); ++i) message += (i ? ", " : "") + all[i]->get_name();
      message += ")";
    }
    std::cerr << "relpos: error: " << relpos::cli::terminal_safe(message) << "\n" << usage_line(app) << "\n";
    return relpos::cli::kExitUsage;
  } catch (const relpos::cli::UsageError& e) {
    std::cerr << "relpos: error: " << relpos::cli::terminal_safe(e.what()) << "\n" << usage_line(app) << "\n";
    return relpos::cli::kExitUsage;
  } catch (const relpos::Error& e) {
    std::cerr << "relpos: error: " << relpos::cli::terminal_safe(e.what()) << "\n";
    return with_output_checked(relpos::cli::kExitFailure);
  } catch (const std::bad_alloc&) {
    std::cerr << "relpos: error: out of memory (a batch, an image or a size too large for this machine?)\n";
    return with_output_checked(relpos::cli::kExitFailure);
  } catch (const std::exception& e) {
    std::cerr << "relpos: error: " << relpos::cli::terminal_safe(e.what()) << "\n";
    return with_output_checked(relpos::cli::kExitFailure);
  }
  return with_output_checked(relpos::cli::exit_status());
}
