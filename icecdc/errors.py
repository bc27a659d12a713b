"""The one base class for errors a user fixes from the message alone (a bad key, a missing
package, a table that disagrees with its config): the CLI prints them without a traceback."""


class UserError(Exception):
    pass
