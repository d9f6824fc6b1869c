import { hostname } from 'node:os';
import { describe, expect, it } from 'vitest';
import { readConfig } from '../../src/server/process/config.js';
import { listenOrigin } from '../../src/server/start/serve.js';

// Where a queue-mode server tells workers to send its jobs' child runs over HTTP (sealed into
// each record): the operator's VIEWER_CACHE_ADVERTISED_URL, or the listen address.

describe('VIEWER_CACHE_ADVERTISED_URL', () => {
  it('is an http(s) origin, or unset; anything else is refused, never ignored', () => {
    expect(readConfig({}).advertisedUrl).toBeNull();
    expect(
      readConfig({ VIEWER_CACHE_ADVERTISED_URL: 'http://vc-1.internal:3000/' }).advertisedUrl,
    ).toBe('http://vc-1.internal:3000');
    expect(readConfig({ VIEWER_CACHE_ADVERTISED_URL: 'https://vc.example' }).advertisedUrl).toBe(
      'https://vc.example',
    );
    for (const bad of [
      'vc-1.internal:3000',
      'ftp://vc-1.internal',
      'http://user:pw@vc-1.internal',
      'http://vc-1.internal/api',
      'http://vc-1.internal/?x=1',
    ]) {
      expect(() => readConfig({ VIEWER_CACHE_ADVERTISED_URL: bad }), bad).toThrow(
        /VIEWER_CACHE_ADVERTISED_URL must be an http\(s\) origin/,
      );
    }
  });

  it('defaults to the listen address; a wildcard host stands for the host name', () => {
    expect(listenOrigin('127.0.0.1', '3000')).toBe('http://127.0.0.1:3000');
    expect(listenOrigin('::1', '3000')).toBe('http://[::1]:3000');
    expect(listenOrigin('0.0.0.0', '3000')).toBe(new URL(`http://${hostname()}:3000`).origin);
    expect(listenOrigin('::', '8080')).toBe(new URL(`http://${hostname()}:8080`).origin);
  });
});
