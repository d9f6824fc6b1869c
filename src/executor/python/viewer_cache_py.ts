/**
 * The `viewer_cache` module a Python runnable imports: standard library only, written next to
 * the job's socket in its private directory for each run. It holds no credential: every query
 * goes to the job's own socket with the job's token, and the executor answers it on the job's
 * leases (the viewer's login, the identity bound). Shipped as text inside the package so that
 * nothing has to copy a `.py` file into `dist/`.
 */
export const VIEWER_CACHE_PY = String.raw`"""viewer-cache client for Python runnables (standard library only).

    from viewer_cache import datatable

    def main(clinic=None):
        db = datatable('clinics', as_viewer=True, roles=['provider'])
        return db.query('select patient_id, name from clinics.patients where clinic = $1', clinic)

Queries run on the job's connection as the viewer (or as a named role); this process never
holds a password or a connection string.
"""
import json
import socket
import sys

__all__ = [
    'datatable', 'Datatable', 'ViewerCacheError', 'NoViewerError', 'NoRolesError',
    'RoleRequiredError', 'RoleNotPermittedError', 'UnknownRoleError', 'UnknownDatatableError',
    'InvalidDatatableRefError', 'JobTokenInvalidError', 'StatementRefusedError',
    'ResultTooLargeError', 'QueryTimeoutError', 'DatabaseError',
]


class ViewerCacheError(Exception):
    """A refusal with a stable code (the same codes as the TypeScript library's errors)."""
    code = 'E_VIEWER_CACHE'

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code


class NoViewerError(ViewerCacheError):
    code = 'E_NO_VIEWER'


class NoRolesError(ViewerCacheError):
    code = 'E_NO_ROLES'


class RoleRequiredError(ViewerCacheError):
    code = 'E_ROLE_REQUIRED'


class RoleNotPermittedError(ViewerCacheError):
    code = 'E_ROLE_NOT_PERMITTED'


class UnknownRoleError(ViewerCacheError):
    code = 'E_UNKNOWN_ROLE'


class UnknownDatatableError(ViewerCacheError):
    code = 'E_UNKNOWN_DATATABLE'


class InvalidDatatableRefError(ViewerCacheError):
    code = 'E_INVALID_DATATABLE_REF'


class JobTokenInvalidError(ViewerCacheError):
    code = 'E_JOB_TOKEN_INVALID'


class StatementRefusedError(ViewerCacheError):
    code = 'E_STATEMENT_REFUSED'


class ResultTooLargeError(ViewerCacheError):
    code = 'E_RESULT_TOO_LARGE'


class QueryTimeoutError(ViewerCacheError):
    code = 'E_QUERY_TIMEOUT'


class DatabaseError(ViewerCacheError):
    """Postgres refused the statement; sqlstate is its SQLSTATE (e.g. '42501')."""
    code = 'E_QUERY_FAILED'

    def __init__(self, message, sqlstate=None):
        super().__init__(message)
        self.sqlstate = sqlstate


_BY_CODE = {cls.code: cls for cls in (
    NoViewerError, NoRolesError, RoleRequiredError, RoleNotPermittedError, UnknownRoleError,
    UnknownDatatableError, InvalidDatatableRefError, JobTokenInvalidError, StatementRefusedError,
    ResultTooLargeError, QueryTimeoutError,
)}

# The agent protocol version this client speaks (the query proxy refuses any other).
_PROTOCOL = 1

_job = {'socket': None, 'token': None}
_conn = {'sock': None, 'file': None, 'next': 0}


def _request(reference, sql, params):
    if _conn['sock'] is None:
        if _job['socket'] is None:
            raise JobTokenInvalidError('no job is running in this process')
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(_job['socket'])
        _conn['sock'] = sock
        _conn['file'] = sock.makefile('rwb')
    _conn['next'] += 1
    message = {'id': _conn['next'], 'protocol': _PROTOCOL, 'jobToken': _job['token'],
               'reference': reference, 'sql': sql, 'params': list(params)}
    f = _conn['file']
    f.write(json.dumps(message, allow_nan=False).encode('utf-8') + b'\n')
    f.flush()
    line = f.readline()
    if not line:
        raise JobTokenInvalidError('the job query proxy closed the connection (has the job ended?)')
    answer = json.loads(line)
    if answer.get('ok'):
        return answer['rows']
    code = answer.get('code') or 'E_VIEWER_CACHE'
    text = answer.get('message') or code
    if code == 'E_QUERY_FAILED':
        raise DatabaseError(text, answer.get('sqlstate'))
    raise _BY_CODE.get(code, ViewerCacheError)(text, code)


def _reference(name, as_viewer, role, roles):
    # As the TypeScript client sends it: { datatable, role }, the viewer request spelt as the
    # role name '@viewer' (narrowed: '@viewer:a,b', sorted), which no real role can have.
    if as_viewer and role is not None:
        raise InvalidDatatableRefError('give either as_viewer=True or role=, not both')
    if roles is not None and not as_viewer:
        raise InvalidDatatableRefError('roles= narrows as_viewer=True: give both')
    if as_viewer:
        if roles is None:
            return {'datatable': name, 'role': '@viewer'}
        if isinstance(roles, str):
            roles = [roles]
        return {'datatable': name, 'role': '@viewer:' + ','.join(sorted(set(roles)))}
    return {'datatable': name, 'role': role}


class Datatable:
    """A data table as this job may reach it; the reference travels as the TypeScript client's."""

    def __init__(self, reference):
        self.reference = reference

    def query(self, sql, *params):
        """Runs one statement with $1..$n parameters; returns its rows as dicts."""
        return _request(self.reference, sql, params)

    def fetch_one(self, sql, *params):
        """The first row of the statement, or None."""
        rows = self.query(sql, *params)
        return rows[0] if rows else None


def datatable(name, as_viewer=False, role=None, roles=None):
    """datatable('main', as_viewer=True) is datatable://main?as=viewer; role='r' is ?role=r;
    roles=['a', 'b'] with as_viewer=True narrows the viewer's connection to those roles."""
    return Datatable(_reference(name, as_viewer, role, roles))


def _run(payload, out):
    _job['socket'] = payload['socket']
    _job['token'] = payload['token']
    try:
        namespace = {'__name__': '__viewer_cache_job__'}
        exec(compile(payload['code'], payload['path'], 'exec'), namespace)
        main = namespace.get('main')
        if not callable(main):
            raise ViewerCacheError('a Python runnable defines main(**args)', 'E_EXECUTOR_FAILED')
        value = main(**payload['args'])
        text = json.dumps({'ok': True, 'value': value}, allow_nan=False)
    except ViewerCacheError as err:
        text = json.dumps({'ok': False, 'code': err.code, 'type': type(err).__name__,
                           'message': str(err)})
    except BaseException as err:  # the job's own failure, reported rather than printed
        text = json.dumps({'ok': False, 'code': None, 'type': type(err).__name__,
                           'message': str(err)})
    out.write(text)
    out.flush()
`;

/**
 * What `python3 -I -c` runs: read the job from stdin, put the private directory (and nothing
 * else) before the standard library, keep the real stdout for the result and send the
 * runnable's own prints (and anything written to fd 1) to stderr.
 */
export const PYTHON_BOOT = [
  'import sys, os, json',
  'payload = json.loads(sys.stdin.readline())',
  'sys.stdin = open(os.devnull)',
  "out = os.fdopen(os.dup(1), 'w', encoding='utf-8')",
  'os.dup2(2, 1)',
  'sys.stdout = sys.stderr',
  "sys.path.insert(0, payload['dir'])",
  'import viewer_cache',
  'viewer_cache._run(payload, out)',
].join('\n');
