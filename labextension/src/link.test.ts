import type { Kernel } from '@jupyterlab/services';
import type { JSONObject } from '@lumino/coreutils';
import type { ISignal, Slot } from '@lumino/signaling';
import { describe, expect, it } from 'vitest';

import { ICommPort, KlbrComm } from './comm';
import { ICommSink, IKernelPort, ILinkListener, IPagePort, ISessionPort, KernelLink } from './link';

/** A signal that shows who is connected to it. */
class Emitter<U> implements ISignal<unknown, U> {
  readonly slots = new Set<[Slot<unknown, U>, unknown]>();

  connect(slot: Slot<unknown, U>, thisArg?: unknown): boolean {
    this.slots.add([slot, thisArg]);
    return true;
  }

  disconnect(slot: Slot<unknown, U>, thisArg?: unknown): boolean {
    for (const entry of this.slots) {
      if (entry[0] === slot && entry[1] === thisArg) {
        return this.slots.delete(entry);
      }
    }
    return false;
  }

  emit(args: U): void {
    for (const [slot, thisArg] of [...this.slots]) {
      slot.call(thisArg, this, args);
    }
  }
}

class FakeKernel implements IKernelPort {
  readonly connectionStatusChanged = new Emitter<Kernel.ConnectionStatus>();
  infoReads = 0;

  constructor(
    readonly implementation: string,
    public connectionStatus: Kernel.ConnectionStatus = 'connected'
  ) {}

  get info(): Promise<{ implementation: string }> {
    this.infoReads += 1;
    return Promise.resolve({ implementation: this.implementation });
  }

  set(status: Kernel.ConnectionStatus): void {
    this.connectionStatus = status;
    this.connectionStatusChanged.emit(status);
  }
}

class FakeSession implements ISessionPort<FakeKernel> {
  readonly kernelChanged = new Emitter<unknown>();
  session: { kernel: FakeKernel | null } | null = null;
  ready = Promise.resolve();

  change(kernel: FakeKernel | null): void {
    this.session = { kernel };
    this.kernelChanged.emit(kernel);
  }
}

/** The window: who listens for what. */
class Page implements IPagePort {
  readonly listeners = new Map<string, Set<EventListenerOrEventListenerObject>>();

  addEventListener(type: string, listener: EventListenerOrEventListenerObject | null): void {
    if (listener !== null) {
      this.listeners.set(type, (this.listeners.get(type) ?? new Set()).add(listener));
    }
  }

  removeEventListener(type: string, listener: EventListenerOrEventListenerObject | null): void {
    if (listener !== null) {
      this.listeners.get(type)?.delete(listener);
    }
  }

  hide(): void {
    for (const listener of this.listeners.get('pagehide') ?? []) {
      if (typeof listener === 'function') {
        listener(new Event('pagehide'));
      } else {
        listener.handleEvent(new Event('pagehide'));
      }
    }
  }
}

/** A comm the link opened: on which kernel, what was closed, and the kernel's side of it. */
class OpenedComm implements ICommPort {
  isDisposed = false;
  closes = 0;

  constructor(
    readonly kernel: FakeKernel,
    readonly sink: ICommSink
  ) {}

  send(_data: JSONObject): void {}

  close(): void {
    this.closes += 1;
  }
}

/** What the link told, in order; `opened` waits for the next comm. */
class Listener implements ILinkListener {
  events: string[] = [];
  private _waiting: Array<(comm: KlbrComm) => void> = [];

  opened(comm: KlbrComm): Promise<void> {
    this.events.push('opened');
    this._waiting.shift()?.(comm);
    return Promise.resolve();
  }

  nextOpened(): Promise<KlbrComm> {
    return new Promise(resolve => this._waiting.push(resolve));
  }

  kernelChanged(): void {
    this.events.push('kernelChanged');
  }

  closed(): void {
    this.events.push('closed');
  }

  state(): void {}
  output(): void {}
  ended(): void {}
}

function setUp() {
  const session = new FakeSession();
  const page = new Page();
  const listener = new Listener();
  const opened: OpenedComm[] = [];
  const link = new KernelLink(session, page, (kernel: FakeKernel, sink) => {
    const comm = new OpenedComm(kernel, sink);
    opened.push(comm);
    return comm;
  }, listener);
  return { session, page, listener, opened, link };
}

/** A link whose session has a connected klbr kernel, once it has opened its comm. */
async function connected() {
  const parts = setUp();
  const kernel = new FakeKernel('klbr');
  const next = parts.listener.nextOpened();
  parts.session.change(kernel);
  return { ...parts, kernel, comm: await next };
}

describe('the link to a session’s kernel', () => {
  it('opens a comm on a connected klbr kernel, and none on another kernel', async () => {
    const { session, listener, opened, link } = setUp();
    session.change(new FakeKernel('ipython'));
    const klbr = new FakeKernel('klbr');
    const next = listener.nextOpened();
    session.change(klbr);
    const comm = await next;
    expect(opened.map(o => o.kernel)).toEqual([klbr]);
    expect(link.comm).toBe(comm);
    expect(comm.isOpen).toBe(true);
  });

  it('opens a fresh comm on a reconnect, closing the one before', async () => {
    const { kernel, listener, opened, link, comm: first } = await connected();
    const next = listener.nextOpened();
    kernel.set('connecting');
    kernel.set('connected');
    const second = await next;
    expect(second).not.toBe(first);
    expect(first.isOpen).toBe(false);
    expect(opened[0].closes).toBe(1);
    expect(link.comm).toBe(second);
  });

  it('on a kernel change, closes the comm, forgets the state and stops hearing the old kernel', async () => {
    const { session, listener, opened, link, kernel: old } = await connected();
    listener.events = [];
    session.change(null);
    expect(listener.events).toEqual(['closed', 'kernelChanged']);
    expect(opened[0].closes).toBe(1);
    expect(link.comm).toBeNull();
    expect(old.connectionStatusChanged.slots.size).toBe(0);
    const reads = old.infoReads;
    old.set('connected');
    expect(old.infoReads).toBe(reads); // no connection attempt on a kernel that is no longer the session's
  });

  it('closes the comm when the page is hidden for good', async () => {
    const { page, opened, link, comm } = await connected();
    page.hide();
    expect(comm.isOpen).toBe(false);
    expect(opened[0].closes).toBe(1);
    expect(link.comm).toBeNull();
  });

  it('lets go of the comm the kernel closed, without closing it again', async () => {
    const { listener, opened, link, comm } = await connected();
    listener.events = [];
    opened[0].sink.closed();
    expect(comm.isOpen).toBe(false);
    expect(opened[0].closes).toBe(0);
    expect(link.comm).toBeNull();
    expect(listener.events).toEqual(['closed']);
  });

  it('disposed: closes the comm and removes every signal connection and DOM listener it made', async () => {
    const { session, page, opened, link, kernel } = await connected();
    expect(page.listeners.get('pagehide')?.size).toBe(1);
    link.dispose();
    expect(opened[0].closes).toBe(1);
    expect(link.comm).toBeNull();
    expect(page.listeners.get('pagehide')?.size).toBe(0);
    expect(session.kernelChanged.slots.size).toBe(0);
    expect(kernel.connectionStatusChanged.slots.size).toBe(0);
  });

  it('attaches to the kernel the session has once it is ready', async () => {
    const session = new FakeSession();
    const kernel = new FakeKernel('klbr');
    session.session = { kernel };
    const listener = new Listener();
    const next = listener.nextOpened();
    const link = new KernelLink(session, new Page(), (k: FakeKernel, sink) => new OpenedComm(k, sink), listener);
    expect(link.comm).toBeNull(); // not before the session is ready
    await next;
    expect(link.comm).not.toBeNull();
  });
});
