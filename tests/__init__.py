"""cgsim's tests: a package, so that test modules and their helpers import one another by
package path (``tests.agreement.observe``), never by putting a folder on ``sys.path``."""
